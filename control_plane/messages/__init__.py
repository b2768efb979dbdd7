"""Messages (enrollment, sign-in and invitation links): a transactional outbox delivered by a
worker with retries, through SMTP, a Twilio-shaped SMS API, or the console."""
