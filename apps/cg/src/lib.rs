//! Fault-tolerant conjugate gradient on veriflow (paper 002).
