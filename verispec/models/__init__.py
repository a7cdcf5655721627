"""verispec.models"""
