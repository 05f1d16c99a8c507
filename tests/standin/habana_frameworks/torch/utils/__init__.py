"""Stand-in for habana_frameworks.torch.utils."""
