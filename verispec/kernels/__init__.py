"""verispec.kernels"""
