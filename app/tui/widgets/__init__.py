"""Widgets of the chat app.  None of them touches a backend: they post messages the App handles."""
