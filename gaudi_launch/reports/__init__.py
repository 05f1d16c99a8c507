"""Commands beside the launch itself: `gaudi-launch report` (plots) and `gaudi-launch env`."""
