// What a plugin of kind comm includes: a communication backend; includes ATen and needs c10d.
#pragma once

#include <ampkit/comm_backend.h>
#include <ampkit/descriptor.h>
