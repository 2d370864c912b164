"""The API's reference: the OpenAPI document of ``/v1`` (``document``), built from pydantic
models of the request bodies (``bodies``) and the answers (``answers``), and the views that serve
it and its rendered page (``views``)."""
