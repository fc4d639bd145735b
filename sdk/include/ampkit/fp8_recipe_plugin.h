// What a plugin of kind fp8_recipe includes: an fp8 scaling recipe.
#pragma once

#include <ampkit/descriptor.h>
#include <ampkit/fp8_recipe.h>
