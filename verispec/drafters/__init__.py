"""verispec.drafters"""
