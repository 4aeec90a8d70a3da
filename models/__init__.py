"""deltamatch.models."""
