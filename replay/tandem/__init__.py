"""tandem: record a guest at its virtual device boundary, replay it into analyses."""
__version__ = "0.1.0"
