"""What every kind's launch runs through: render (Jinja to Triton source), build (source to
kernel), binding (operands, outputs and the launches every kind shares) and replay."""
