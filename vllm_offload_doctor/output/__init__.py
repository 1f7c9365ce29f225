"""What every command's output shares: formats and the schema version, terminal colour, the HTML
page frame. Leaves: they import nothing of the commands."""
