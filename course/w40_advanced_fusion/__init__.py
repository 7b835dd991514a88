"""Week 40: advanced fusion and the phase review (CuTe layouts, the Triton compiler, linear and block-sparse attention, the capstone block)."""
