"""The bottom layer: errors and configuration mapping. Imports nothing of sloctl."""
