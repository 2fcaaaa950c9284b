"""Shared building blocks of every Attest service: settings, errors, server, telemetry."""
