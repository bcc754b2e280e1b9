"""One router per resource; issue 7's review pages add their own next to these."""
