"""The application layer: workflows that join the core, roofline and calibration."""
