"""Speculative decoding: methods, proposers, the draft gate, acceptance bookkeeping."""
