"""Human-facing output, drawn from what it is given and never starting anything: the live start-up view handed to
the launcher (`live`), level progress (`progress`), terminal tables (`terminal`, `tables`, `compare_terminal`),
doctor's diagnosis (`doctor`), charts and the HTML run report (`charts`, `html`, `html_sections`)."""
