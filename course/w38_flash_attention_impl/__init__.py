"""Week 38: FlashAttention implementation (backward, FA-2, GQA, varlen, decoding, tensor cores)."""
