"""What a user does to their memory as a whole: keep nothing for a while, forget, list."""
