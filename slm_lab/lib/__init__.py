"""Small shared helpers: io, logging, math, decay schedules."""
