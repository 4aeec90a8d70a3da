"""deltamatch.reports."""
