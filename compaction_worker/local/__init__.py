"""Local tooling: embedded broker and Redis for development, and the demo."""
