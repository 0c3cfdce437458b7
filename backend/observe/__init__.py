"""What the live Conductor measures over a window, in the twin report's names."""
