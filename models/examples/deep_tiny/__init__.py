"""Example generic servd package that is mostly Python: many layers of very small ops."""
