"""Screens of the chat app: help, model picker, hardware, settings, small prompts."""
