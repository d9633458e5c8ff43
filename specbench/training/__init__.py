"""Training drafters: synthetic data from the verifier (synth) and distillation (distill, sd2)."""
