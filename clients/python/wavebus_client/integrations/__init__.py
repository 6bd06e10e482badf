"""Engine integrations: the few lines a user adds to an engine wavebus did not write (docs/transformers.md)."""
