"""deltamatch.kernels."""
