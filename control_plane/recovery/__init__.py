"""Account recovery requests (issue 23): a user who lost every passkey and their e-mail is let
back in at a new destination once an operator approves."""
