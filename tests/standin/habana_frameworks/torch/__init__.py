"""Stand-in for habana_frameworks.torch (the Gaudi PyTorch bridge)."""
