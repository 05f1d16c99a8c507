"""Stand-in for habana_frameworks.torch.distributed."""
