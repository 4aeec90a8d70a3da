"""deltamatch.evals."""
