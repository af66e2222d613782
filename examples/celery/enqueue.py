"""Publish one send_confirmation message for an order, as the application
does when an order is placed:

    .venv/bin/python enqueue.py ORD-1001 [--email ADDRESS]

The message is tasks.confirmation_args(order) (the same arguments for the
same order every time); --email gives another address, i.e. the same key
with other arguments (the claim refuses it: ID002). It goes to the queue
tasks.py names ($CELERY_QUEUE) on $CELERY_BROKER_URL, with publisher
confirms: exit 0 means the broker has the message.
"""
import argparse

from tasks import app, confirmation_args, send_confirmation

ap = argparse.ArgumentParser(description="enqueue send_confirmation for one order")
ap.add_argument("order")
ap.add_argument("--email", help="another address than the order's (other arguments)")
args = ap.parse_args()
kwargs = confirmation_args(args.order)
if args.email:
    kwargs["email"] = args.email
app.conf.broker_transport_options = {"confirm_publish": True}
send_confirmation.apply_async(kwargs=kwargs)
