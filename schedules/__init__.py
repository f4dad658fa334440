"""Model cost arithmetic and training-step programs (who computes and communicates what, when)."""
