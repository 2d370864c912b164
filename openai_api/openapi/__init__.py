"""The API's reference: the OpenAPI document of ``/v1`` (``document``), generated from the
pydantic models that check the requests (``gateway.validation``, ``batches``) and from those of
the answers (``answers``), and the views that serve it and its rendered page (``views``)."""
