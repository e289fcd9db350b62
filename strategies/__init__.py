"""Server-side unlearning methods (Flower strategies) and their pure aggregation math."""
