from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    @property
    def task_id(self) -> str:
        """The id of the order's stepwarden task: submitting it twice creates it once."""
        return f"order-{self.pk}"


class Line(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    sku = models.CharField(max_length=64)
    quantity = models.IntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(quantity__gt=0), name="quantity_positive")
        ]
