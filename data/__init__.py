"""ARC data: loading and validation, canvas encoding, augmentation, features, curriculum."""
