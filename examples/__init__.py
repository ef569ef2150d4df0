"""The bundled example catalogue: skill files under ``skills/`` and the tools they run."""
