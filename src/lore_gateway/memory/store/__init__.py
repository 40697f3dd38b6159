"""The write path: turns as records, made safe to keep, written by one writer."""
