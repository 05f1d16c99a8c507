"""Multi-host test cluster (network namespaces + sshd) and the tests that prove it."""
