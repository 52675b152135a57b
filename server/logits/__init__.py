"""Logits processing on the model's thread: grammar masks for constrained outputs, penalties, logit_bias."""
