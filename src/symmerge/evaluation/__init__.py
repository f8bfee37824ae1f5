"""Loss through the stock forward, and the barrier of two or many models."""
