"""Experiment control (Session, Trial), analysis, graphs and search."""
