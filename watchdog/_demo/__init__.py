"""The bundled demo job and its runner."""
