//! 3D two-species advection-diffusion-reaction on veriflow's iterative mode (paper 000).
