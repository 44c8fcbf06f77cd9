"""Example generic servd package: a small classifier built from servd ops."""
