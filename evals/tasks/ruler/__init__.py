"""Data folder of deltamatch.evals (a package only so that its files ship in the wheel)."""
