"""Building blocks shared by every method's round function."""
