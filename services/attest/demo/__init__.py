"""The bundled sample corpus and the demo that runs on it."""
