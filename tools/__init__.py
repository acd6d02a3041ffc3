"""Tools that work on the lab from outside it (generators of docs); nothing under slm_lab/ imports them."""
