//! N-Queens on veriflow (paper 004).
