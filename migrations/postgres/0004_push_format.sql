-- Push subscriptions gain a format (DESIGN §5): `json` (the webhook of before) or `soap` (a SOAP
-- envelope to a SOAP endpoint). The rules are JSON text; existing push subscriptions say `json`
-- explicitly from now on (the code also reads a missing format as `json`).
UPDATE subscriptions SET rules = jsonb_set(rules::jsonb, '{format}', '"json"')::text
    WHERE rules::jsonb ->> 'mode' = 'push' AND NOT (rules::jsonb ? 'format');
