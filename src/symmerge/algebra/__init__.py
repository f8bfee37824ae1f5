"""The symmetry group: architectures' shapes, group kinds and specs, canonical form, group action."""
