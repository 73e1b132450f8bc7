"""The budget, pure: token counts, context windows, provider overflow errors, file attachments."""
