"""Reading a workflow run's history in tests: the activities it ran."""

from __future__ import annotations

import json

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory

LOCAL_ACTIVITY_MARKER = "core_local_activity"


def activities_run(history: WorkflowHistory) -> list[str]:
    """The activity types the run scheduled, in order: regular ones (scheduled
    events) and local ones (their markers, one per completed local activity)."""
    names = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        elif (
            event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        ):
            data = event.marker_recorded_event_attributes.details["data"].payloads[0].data
            names.append(json.loads(data)["activity_type"])
    return names
